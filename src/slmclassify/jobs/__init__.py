"""The commands' work, as functions a program can call: each reads its input, runs the library and
writes its output; the CLI (`cli/`) only parses options and prints. `classify` streams a table
into an output (resumable), `verify` checks probes against the per-item path, `evaluate` scores
against gold labels, `fit` trains a learned head, `ray_classify` runs classify on Ray actors."""
