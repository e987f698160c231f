"""Which hidden states a head reads from the scoring pass (`Engine.read_states`).

Layer numbers are Hugging Face's `hidden_states` numbering: 1 .. n_layers, the last one after the
final norm. Two poolings, read from the same forward that scores the labels:

    last  the state at the item's last prompt token (what the output layer reads)
    mean  the mean over the item's own tokens: the prompt's positions from `pool_from` (the end
          of the prompt head every item shares, the prefix the cache holds) to its end. Layers
          1 .. n_layers - 1: the last layer is computed at the read positions only.

A tapped pass returns [B, len(taps), hidden]: the `last` layers in order, then the `mean` ones.

`echo`: the pass reads each item's text twice (`echoed`, rendered so by `Scorer.encode`), so that the means also hold states of
tokens that have seen the whole text (a causal model's first tokens see only the text's start). It
changes the prompt, so the pass's label scores are those of the echoed prompt, not the task's
zero-shot ones (docs/learned-heads.md, "Echo").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Taps:
    last: tuple[int, ...] = ()
    mean: tuple[int, ...] = ()
    echo: bool = False
    """Each item's text read twice (`echoed`)."""

    def __post_init__(self):
        object.__setattr__(self, "last", tuple(int(t) for t in self.last))
        object.__setattr__(self, "mean", tuple(int(t) for t in self.mean))
        object.__setattr__(self, "echo", bool(self.echo))

    def __len__(self) -> int:
        return len(self.last) + len(self.mean)

    def out_of_range(self, n_layers: int) -> list[str]:
        """The taps a model of `n_layers` layers cannot give, as `describe` names them."""
        return ([str(t) for t in self.last if not 1 <= t <= n_layers]
                + [f"mean{t}" for t in self.mean if not 1 <= t < n_layers])

    def describe(self) -> str:
        """'15, 22, 30 (last token); 10, 15 (mean)'"""
        parts = [f"{', '.join(map(str, t))} ({name})" for t, name in ((self.last, "last token"), (self.mean, "mean"))
                 if t]
        return ("; ".join(parts) or "none") + (", each text read twice (echo)" if self.echo else "")

    def as_list(self) -> list[str]:
        """The taps as `--layers` takes them: '15', 'mean10'."""
        return [str(t) for t in self.last] + [f"mean{t}" for t in self.mean]

    @classmethod
    def parse(cls, items) -> Taps:
        """From `as_list`'s form (or plain ints: last-token layers); ValueError names a bad one."""
        last, mean = [], []
        for item in items:
            text = str(item).strip()
            target, number = (mean, text[4:]) if text.lower().startswith("mean") else (last, text)
            if not number.isdigit():
                raise ValueError(f"{text!r} is not a layer number (15) or a mean-pooled layer (mean15)")
            target.append(int(number))
        return cls(tuple(last), tuple(mean))


ECHO_SEPARATOR = "\n"


def echoed(text: str) -> str:
    """The text, a newline, the text again; an empty (or blank) text stays as it is, so it stays empty."""
    return f"{text}{ECHO_SEPARATOR}{text}" if text.strip() else text
