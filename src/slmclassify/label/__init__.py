"""The labelling loop behind `slmclassify label`: a person answers items one at a time while a head
is refitted in the background, and the next item is chosen by active learning. Modules:

    store     LabelStore: every answer durable when given (SQLite, WAL, synchronous=FULL)
    strategy  Picker: which item to show next, and a line saying why (pure numpy, seeded)
    session   LabelSession: the loaded model, the background scorer and refitter, export and fit

Layer: like `serve` and `ray` (may import head, classifier, models, core, io; never the CLI).
"""
