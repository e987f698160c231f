"""The pipeline, in the order data flows through it:

    task          what to classify: labels, prompt, mode, calibration (a frozen dataclass, validated
                  from a task file's data or from values)
    settings      how the fast path schedules work (`EngineSettings`); settings_sources merges
                  flags, the task file's settings and the user's saved defaults, given as data
    prompts       render each item's chat prompt; the shared head is the prefix
    encode        tokenize once, split off the prefix, cut long texts, find duplicates
    batching      length buckets under a token budget, left-padded
    engine        the forward pass with the prefix key/value cache, reading label scores only
    labels        label token sequences and the trie the engine scores them with
    multilabel    a multi-label task's yes/no branches, P(yes), thresholds and F1
    questions     several questions per item in its one pass: branches, calibration, answers
    calibration   content-free prior and temperature
    results       probabilities, confidence and status per item, in input order
    reference     the per-item path in plain transformers: the oracle the fast path must equal
    verify        probe items through both paths
    metrics       accuracy, F1, calibration and thresholds against gold labels
    families      each model family as a description (norms, scales, layer kinds) the engine follows
    config_check  what a model config must be for the engine to be exact (derived from families)
    article_tickets  the article's tickets: the bench workload and the calibration sample

Nothing here loads a model (`models/`) or reads or writes a file: `io/` does (tables, task files,
saved defaults, labelled items, plots) and hands over plain data; `jobs.sources` builds the task and
settings from it, and `slmclassify.classifier` puts the pipeline together. `tests/test_imports.py`
holds core to that.
"""
