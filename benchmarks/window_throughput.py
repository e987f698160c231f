"""The 600 article tickets, embedded model: today's whole-file scoring vs classify_iter with windows,
interleaved in one process (old, default window, window 128, old, default, 128 ...). One JSON line per pass."""
import json, sys, time
import numpy as np
import torch
from slmclassify import Classifier, EngineSettings, load_model
from slmclassify.workload import ARTICLE_TASK, article_tickets

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
texts = article_tickets(600)
loaded = load_model(None)
clf = Classifier(ARTICLE_TASK.with_overrides(mode="first"), model=loaded)
clf.score(clf.encode(texts[:8]))  # warm-up
print(json.dumps({"threads": torch.get_num_threads(), "distinct_texts": len(set(texts))}), flush=True)
first_labels = None
for r in range(rounds):
    for name, window in (("whole-file (today)", None), ("window 1024 (default)", 1024), ("window 128", 128)):
        start = time.perf_counter()
        if window is None:
            clf.settings = EngineSettings()
            scores = clf.score(clf.encode(texts))
            labels = scores.argmax(axis=1)
            padding = clf.stats.padding_share
        else:
            clf.settings = EngineSettings(window=window)
            res = clf.classify(texts)
            labels = np.array([np.argmax([x.scores[lab] for lab in ARTICLE_TASK.labels]) for x in res])  # raw, like above
            padding = clf.stats.padding_share
        seconds = time.perf_counter() - start
        if first_labels is None:
            first_labels = labels
        print(json.dumps({"round": r, "way": name, "seconds": round(seconds, 2), "items_per_s": round(600 / seconds, 2),
                          "padding": round(padding, 4), "reused": getattr(clf.stats, "reused", 0),
                          "same_labels_as_first": int((labels == first_labels).sum())}), flush=True)
