"""Option groups shared by the commands, `bundle` (a command gets a group's values as one frozen
options object, not one parameter per flag), the one place that builds a Task and EngineSettings
from them, and the names of the flags that set each library field (library errors name fields; the
CLI names flags). The same setting has the same flag in every command; old names stay as hidden
aliases."""

from __future__ import annotations

import dataclasses
import functools

import click

from ..backends.names import DEVICES, PRECISIONS
from ..core.task import MODES, Task, parse_labels
from ..jobs.sources import build_task
from ..errors import SlmClassifyError, TaskError

FLAGS = {
    "max_text_tokens": "--max-tokens",
    "max_queue_items": "--max-queue",
    "request_timeout_s": "--request-timeout",
    "taps": "--layers",
    "fmt": "--format",
    "plots_dir": "--plots",
    "task_file": "--task",
    "gold_columns": "--gold-column",
    "use_scores": "--scores",
    "plot_path": "--plot",
    "json_path": "--json",
}
"""Library fields whose flag is not the field's name with dashes (`max_rows` → `--max-rows`)."""
TASK_FILE_ONLY = ("label_separator", "thresholds", "descriptions", "examples", "temperature")
"""Task fields with no flag: set in a task file only, where the key is the field's name."""


def flag_of(field: str) -> str:
    """The command-line flag that sets a library field, or, for a task-file key, how to name it."""
    if field in TASK_FILE_ONLY:
        return f"the task file's {field}"
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def flag_error(exc: SlmClassifyError) -> SlmClassifyError:
    """A library error as the CLI says it: naming flags where the library names fields."""
    return exc.renamed(flag_of) if exc.template is not None else exc


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The options that define the task and how the model runs, as typed (None: not given)."""

    task_file: str | None = None
    labels: str | None = None
    instruction: str | None = None
    system: str | None = None
    user_template: str | None = None
    """As typed: `\\n` and `\\t` are unescaped when the task is built."""
    mode: str | None = None
    min_confidence: float | None = None
    calibrate: bool | None = None
    multi_label: bool | None = None
    model: str | None = None
    token_budget: int | None = None
    max_rows: int | None = None
    max_tokens: str | None = None
    """`N` or `none`, as typed."""
    device: str | None = None
    precision: str | None = None

    @property
    def has_task(self) -> bool:
        """Whether the labels come from these options (a task file or --labels)."""
        return bool(self.task_file or self.labels)

    def label_names(self) -> tuple[str, ...] | None:
        return parse_labels(self.labels) if self.labels else None

    def overrides(self) -> dict:
        """The task fields given as flags (unescaped), for `build_task` and `Task.with_overrides`."""
        return dict(instruction=self.instruction, system=self.system, user_template=unescape(self.user_template),
                    mode=self.mode, min_confidence=self.min_confidence, calibrate=self.calibrate,
                    multi_label=self.multi_label)

    def task(self) -> Task:
        """The task from the flags and/or the task file; flags win."""
        return build_task(self.task_file, self.label_names(), **self.overrides())

    def settings(self, *, window: int | None = None, scheduling: bool = True):
        """The engine settings from the flags, the task file, the saved defaults and the built-ins
        (`jobs.sources.engine_settings`); `scheduling` False ignores --token-budget/--max-rows."""
        from ..jobs.sources import engine_settings

        settings = engine_settings(self.task_file, self.token_budget if scheduling else None,
                                   self.max_rows if scheduling else None,
                                   parse_max_tokens(self.max_tokens),
                                   device=self.device, precision=self.precision)
        return settings if window is None else dataclasses.replace(settings, window=window)


def bundle(param: str, make, options: list):
    """A decorator adding `options` to a command, which gets their values as one argument,
    `param=make(**values)` (a frozen options object), instead of one parameter per option. `make`
    may raise: it runs when the command is invoked, before its body."""
    names = _names(options)

    def decorate(fn):
        @functools.wraps(fn)
        def command(**kwargs):
            kwargs[param] = make(**{name: kwargs.pop(name) for name in names})
            return fn(**kwargs)

        return _apply(command, options)

    return decorate


def _names(options: list) -> tuple[str, ...]:
    """The parameter names `options` pass to a command (each click decorator makes a new parameter
    when applied, so applying them to a throw-away function changes nothing)."""
    def probe():
        pass

    _apply(probe, options)
    return tuple(param.name for param in reversed(probe.__click_params__))


def _apply(fn, options):
    for option in reversed(options):
        fn = option(fn)
    return fn


def task_options(fn):
    """Options that define the task and run the model, shared by every command that scores; the
    command gets them as one `opts: ModelOptions`."""
    return bundle("opts", ModelOptions, [
        click.option("--task", "task_file", type=click.Path(dir_okay=False), help="TOML task file."),
        click.option("--labels", help="Comma-separated labels, e.g. billing,technical,account; CSV quoting "
                                      "for a comma inside a name: '\"x,y\",z'."),
        click.option("--instruction", help="First line of the system turn."),
        click.option("--system", help="Replace the whole system turn with TEXT."),
        click.option("--user-template", help="Wrap each item, e.g. 'Ticket: {text}\\nCategory:'."),
        click.option("--mode", type=click.Choice(MODES), help="Label scoring mode (default auto)."),
        click.option("--min-confidence", type=float, help="Below this, needs_review = true (default 0.5)."),
        click.option("--calibrate/--no-calibrate", default=None,
                     help="Remove label priors measured on content-free inputs (contextual calibration)."),
        click.option("--multi-label", is_flag=True, default=None,
                     help="Several labels per item: each label's P(yes), the labels at or above their thresholds "
                          "in a `labels` column (task file: multi_label = true)."),
        model_option(),
        token_budget_option(),
        max_rows_option(),
        max_tokens_option(),
        *device_options(),
    ])(fn)


def model_option():
    return click.option("--model", help="HF model id, local folder or .gguf file (default: embedded SmolLM2-135M).")


def served_model_name_option():
    return click.option("--served-model-name", "served_model_names", multiple=True, metavar="ID",
                        help="An id requests name the model by (repeat for aliases; the first is listed first). "
                             "Default: the model's own id (smollm2-135m-instruct for the embedded model, a "
                             "folder's or .gguf file's name, a hub id as given).")


def token_budget_option(help="Max rows × padded tokens per batch."):
    return click.option("--token-budget", type=int, help=help)


def max_rows_option(help="Max rows per batch."):
    return click.option("--max-rows", type=int, help=help)


def max_tokens_option(help="Cut item texts to N tokens (default 512; none: only at the model's context)."):
    return click.option("--max-tokens", metavar="N|none", help=help)


def device_options() -> list:
    """--device and --precision, for every command that runs the model (names only: no torch import
    while the CLI is built, so Ctrl-C during start-up is handled by `main`)."""
    return [
        click.option("--device", type=click.Choice(DEVICES), help="Where the model runs (default auto: CUDA if available)."),
        click.option("--precision", type=click.Choice(PRECISIONS),
                     help="fp32 (CPU default), bf16 (CUDA default), fp16, int8 (CPU), or auto: a low precision "
                          "only if it is faster here and agrees with fp32 on >= 99.5% of 200 items of the input."),
    ]


def hidden_alias(old: str, dest: str, **kwargs):
    """An old flag kept working, hidden from --help; the command merges it with its new name (`merged`)."""
    return click.option(old, dest, hidden=True, **kwargs)


def merged(new, old, new_flag: str, old_flag: str):
    """The value of a flag given under its new name or its old (hidden) one, not both."""
    if new is not None and old is not None:
        raise TaskError(f"{old_flag} is the old name of {new_flag}; give one of them")
    return new if new is not None else old


def parse_max_tokens(value: str | None) -> int | None:
    """`--max-tokens N` (a positive number) or `none` (no cap); None when not given."""
    from ..core.settings_sources import NO_CAP

    if value is None:
        return None
    if str(value).strip().lower() == "none":
        return NO_CAP
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise TaskError(f"--max-tokens must be a positive number of tokens or 'none' (no cap), got {value!r}")
    return tokens


def unescape(template: str | None) -> str | None:
    """Let shells pass `\\n` in --user-template."""
    return None if template is None else template.replace("\\n", "\n").replace("\\t", "\t")


def int_list(spec: str, option: str) -> list[int]:
    """`1,2,3` → [1, 2, 3]: positive integers, or an error naming `option`."""
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise TaskError(f"{option} must be comma-separated integers, got {spec!r}") from None
    if not values or min(values) < 1:
        raise TaskError(f"{option} must list positive integers, got {spec!r}")
    return values


@dataclasses.dataclass(frozen=True)
class HeadOptions:
    """--head and --scorer, as typed (None: not given)."""

    head_path: str | None = None
    scorer: str | None = None


head_options = bundle("head", HeadOptions, [
    click.option("--head", "head_path", type=click.Path(dir_okay=False),
                 help="A head fitted by `slmclassify fit` (or `head = ...` in the task file)."),
    click.option("--scorer", type=click.Choice(["zero-shot", "head", "combined"]),
                 help="zero-shot label scoring, the head, or their product (default: the head when given)."),
])
"""--head and --scorer, for the commands that can apply a learned head (`slmclassify fit`); the
command gets them as one `head: HeadOptions`."""


def task_and_head(head: HeadOptions, opts: ModelOptions):
    """(task, `HeadChoice`): a head without task flags brings the task it was fitted with."""
    from ..head.apply import HeadChoice, head_path_in_task_file, resolve_scorer, task_of
    from ..head.model import Head

    head_path = head.head_path or head_path_in_task_file(opts.task_file)
    loaded = Head.load(head_path) if head_path else None
    if loaded is not None and not opts.has_task:
        task = task_of(loaded).with_overrides(**opts.overrides())
    else:
        task = opts.task()
    return task, HeadChoice(loaded, resolve_scorer(loaded, head.scorer), head_path)
