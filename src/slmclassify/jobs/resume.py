"""What the resumable jobs (`classify`, `batch`) share: the checks before a partial run is continued
(the partial and its record whole, the run's input, options and model the ones that made them), and
the chunk loop's way out (`writing`)."""

from __future__ import annotations

import hashlib
import signal
from contextlib import contextmanager

from ..errors import InputError
from ..interrupts import handle_sigterm
from ..io.checkpoint import changed, digest, input_read_changed, refuse_damaged, refuse_resume
from ..io.sink import WriteFailed


def saved_run(checkpoint, identity, resume, restart, input_path, fmt: str) -> dict | None:
    """The record of the run to continue (resume), or None to start fresh; refuses what it must."""
    if checkpoint is None or not checkpoint.exists():
        return None
    saved = checkpoint.load()
    if restart:
        checkpoint.discard()
        return None
    if not resume:
        if saved is None and (why := checkpoint.unusable_record()):  # --resume would refuse it: say so now
            raise InputError("{partial} holds an unfinished run that cannot be resumed ({why}); pass {restart} to "
                             "start over", names={"restart": "restart"}, partial=checkpoint.partial, why=why)
        done = f" ({saved['rows_done']} rows done)" if saved else ""
        raise InputError("{partial} holds an unfinished run{done}; pass {resume} to continue it, or {restart} to "
                         "start over", names={"resume": "resume", "restart": "restart"}, partial=checkpoint.partial,
                         done=done)
    if saved is None:
        why = checkpoint.unusable_record()
        if why:  # rows may be done, but nothing says which: never dropped without a word
            raise refuse_damaged(checkpoint, why)
        checkpoint.discard()  # an empty partial without a record: no chunk was ever completed
        return None
    damage = checkpoint.damage(saved, fmt)
    if damage:
        raise refuse_damaged(checkpoint, damage)
    reason = changed(saved, identity) or input_read_changed(saved, input_path)
    if reason:
        raise refuse_resume(checkpoint, reason)
    return saved


def same_model(saved: dict | None, identity: dict, loaded, checkpoint) -> None:
    """Add the loaded model and precision to `identity`; refuse to resume a run made with others."""
    identity["model"] = digest([loaded.name, model_fingerprint(loaded)])
    identity["model_shown"] = {"model": loaded.name}
    if saved is not None and saved.get("model") != identity["model"]:
        same_name = saved.get("model_shown", {}).get("model") == loaded.name
        raise refuse_resume(checkpoint, "the model changed (same name, other weights or config)" if same_name
                            else changed({"model": saved.get("model"), "model_shown": saved.get("model_shown")},
                                         {"model": identity["model"], "model_shown": identity["model_shown"]}))
    identity["precision"] = loaded.backend.precision  # what --precision auto picked, too
    if saved is not None and saved.get("precision", identity["precision"]) != identity["precision"]:
        raise refuse_resume(checkpoint, f"the precision changed ({saved['precision']} → {identity['precision']})")


def kernels_of(loaded) -> dict:
    """What the run computes with, recorded so that a resumed run computes the same bits: the precision,
    the GEMM kernel and the attention kernel (C on packed rows, or torch's where the C one cannot run)."""
    engine, backend = loaded.engine, loaded.backend
    attention = "C" if backend.packs_attention(engine.head_dim) else "torch"
    return {"precision": backend.precision, "kernel": backend.gemm, "attention": attention}


def same_kernels(saved: dict | None, identity: dict, loaded, checkpoint) -> None:
    """Add the kernels to `identity`; refuse to resume a run whose recorded kernels cannot run now (the
    C attention kernel or the ordered GEMM no longer builds: a compiler removed, `SLMCLASSIFY_CC` set),
    since its rows and the new ones would differ in their last bits. A run recorded before the
    attention kernel was recorded is not refused for it."""
    identity["gemm"] = now = kernels_of(loaded)
    recorded = (saved or {}).get("gemm")
    if not isinstance(recorded, dict) or recorded.get("precision") != now["precision"]:
        return  # another precision is refused by `same_model`
    for name, what in (("kernel", "GEMM"), ("attention", "attention kernel")):
        if recorded.get(name, now[name]) != now[name]:
            raise refuse_resume(checkpoint, f"the {what} changed ({recorded[name]} → {now[name]}: the "
                                f"{recorded[name]} one cannot run here now, see the engine line)")


def model_fingerprint(loaded) -> str:
    """The model's config, tokenizer size and embedding weights (what makes its scores)."""
    model = loaded.model
    weights = model.get_input_embeddings().weight.detach().cpu().contiguous().numpy()  # the same bytes on any device
    return digest([model.config.to_json_string(), len(loaded.tokenizer), hashlib.sha256(weights.tobytes()).hexdigest()])


@contextmanager
def writing(sink, state, bar, close):
    """Around a job's loop of chunks appended to `sink`: SIGTERM read as Ctrl-C; on Ctrl-C or a failed
    write (a full disk) the finished chunks stay for --resume and what the user reads is raised; on any
    other error the sink is abandoned; `close()` (the input) always; the sink finished when the loop
    ends. `state`: the job's run state (its `rows`, `to_json()`); `bar`: its meter."""
    previous = handle_sigterm()
    try:
        yield
    except KeyboardInterrupt as exc:
        bar.close()
        raise sink.interrupted(state, getattr(exc, "signal", signal.SIGINT)) from None
    except WriteFailed as failed:
        bar.close()
        sink.abandon()
        raise sink.write_failed(failed.error) from None
    except BaseException:
        bar.close()
        sink.abandon()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        close()
    bar.close()
    sink.finish()
