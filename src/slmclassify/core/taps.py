"""Which hidden states a head reads from the scoring pass (`Engine.read_states`).

Layer numbers are Hugging Face's `hidden_states` numbering: 1 .. n_layers, the last one after the
final norm. Two poolings, read from the same forward that scores the labels:

    last  the state at the item's last prompt token (what the output layer reads)
    mean  the mean over the item's own tokens: the prompt's positions from `pool_from` (the end
          of the prompt head every item shares, the prefix the cache holds) to its end. Layers
          1 .. n_layers - 1: the last layer is computed at the read positions only.

A tapped pass returns [B, len(taps), hidden]: the `last` layers in order, then the `mean` ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Taps:
    last: tuple[int, ...] = ()
    mean: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "last", tuple(int(t) for t in self.last))
        object.__setattr__(self, "mean", tuple(int(t) for t in self.mean))

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
        return "; ".join(parts) or "none"

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
