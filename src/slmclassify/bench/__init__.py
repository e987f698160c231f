"""Measurements, side by side in one process: `compare` (`slmclassify bench`: ours against the
article's loop, plain transformers, llama.cpp and CTranslate2), `sweep` (batch settings),
`service_load` (the HTTP service under load), `head_cost` (what a learned head adds),
`ray_scaling` (Ray actors against one process), and `label_sim` (the labelling loop simulated,
random against the shipped picks). Their sides are timed by `timing.py` (interleaved rounds,
ratios per round); `article` holds the article's code paths, `on_batches` times other scorers
against ours on our batches."""
