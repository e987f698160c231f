"""The labelling loop behind `slmclassify label`: a person (or a team) answers items one at a time
while a head is refitted in the background, and the next item is chosen by active learning. Modules:

    store     LabelStore: every answer durable when given (SQLite, WAL, synchronous=FULL)
    answers   the store's answers, kinds, skips and history by pool position
    pool      the seeded sample, its scores and hidden states, and the background scorer
    strategy  Picker: which item to show next, and a line saying why (pure numpy, seeded)
    refit     the loop's head, its honest accuracy estimate and the auto-label threshold
    refitter  the background refit: when to fit, what it publishes
    sync      the lock and signals the session's threads share
    view      the page's item, history, skipped rows and advice
    outputs   the export of the answered rows and the head fitted on them
    team      who labels: members, tokens, the overlap rule, an item's consensus
    agreement agreement between annotators, with bootstrap intervals (numpy only)
    exports   the `datasets` Parquet and the Label Studio import of a team's answers
    suspects  likely label errors: answers an out-of-fold head finds least likely
    session   LabelSession: loads the model and the input, and coordinates the parts above
    app       the page's web app (FastAPI), behind the token check of `web/guard.py`
    server    bind 127.0.0.1 (`web/bind.py`), start the session, serve the page

Layer: like `serve` and `ray` (may import head, classifier, models, core, io, web; never the CLI).
"""
