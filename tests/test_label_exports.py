"""The team-labelling exports (`label/exports.py`), read back the way their users read them: the
Parquet file with the real `datasets` (offline, with this test's own cache) and pandas, the Label
Studio file against a JSON schema of Label Studio's documented import format, its config with
xml.etree."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pandas as pd
import pytest

from slmclassify.errors import FieldError, InputError, TaskError
from slmclassify.label.exports import LabelledItem, label_studio_config, write_label_studio, write_parquet

LABELS = ("positive", "negative", 'the "other" <one> & more')
ANNOTATORS = ("ana", "bo@example.org", "çé")

ITEMS = (
    # rows out of order: the exports write input order
    LabelledItem(row=7, text='He said "ok" — naïve café 🙂', answers={"bo@example.org": "negative", "ana": "negative"},
                 reviewer=None, reviewed=None, gold="negative", extra={"source": "web", "score": 1.5}),
    LabelledItem(row=2, text="a tie, reviewed", answers={"ana": "positive", "çé": LABELS[2]},
                 reviewer="rev", reviewed=LABELS[2], gold=LABELS[2], extra={"source": "mail", "score": 2}),
    LabelledItem(row=4, text="a tie nobody resolved", answers={"ana": "positive", "bo@example.org": "negative"},
                 reviewer=None, reviewed=None, gold=None, extra={"source": None, "score": None}),
    LabelledItem(row=5, text="nobody answered yet", answers={}, reviewer=None, reviewed=None, gold=None,
                 extra={"tags": ["a", "b"]}),
)
IN_ORDER = sorted(ITEMS, key=lambda it: it.row)


@pytest.fixture
def hf_datasets(tmp_path, monkeypatch):
    """`datasets`, offline, with its caches in this test's folder (nothing shared, no network)."""
    home = tmp_path / "hf"
    for key, value in (("HF_HOME", home), ("HF_DATASETS_CACHE", home / "datasets"), ("HF_DATASETS_OFFLINE", "1"),
                       ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(key, str(value))
    datasets = pytest.importorskip("datasets")
    # already imported by an earlier test: its config read the environment then
    for name, value in (("HF_CACHE_HOME", str(home)), ("HF_DATASETS_CACHE", home / "datasets"),
                        ("HF_MODULES_CACHE", home / "modules"), ("HF_HUB_OFFLINE", True),
                        ("HF_DATASETS_OFFLINE", True)):
        monkeypatch.setattr(datasets.config, name, value)
    return datasets


def _features(datasets):
    """The features the Parquet file should carry, built with `datasets` itself."""
    label = datasets.ClassLabel(names=list(LABELS))
    return datasets.Features({
        "row": datasets.Value("int64"), "text": datasets.Value("string"), "label": label,
        "label_name": datasets.Value("string"), **{f"answer_{a}": label for a in ANNOTATORS},
        "reviewer": datasets.Value("string"), "reviewed": label, "n_answers": datasets.Value("int64"),
        "source": datasets.Value("string"), "score": datasets.Value("float64"), "tags": datasets.Value("string")})


def test_parquet_metadata_is_what_datasets_writes(tmp_path, hf_datasets):
    import pyarrow.parquet as pq

    path = tmp_path / "gold.parquet"
    assert write_parquet(ITEMS, LABELS, ANNOTATORS, path) == 4
    schema = pq.read_schema(path)
    expected = _features(hf_datasets)
    assert json.loads(schema.metadata[b"huggingface"]) == {"info": {"features": expected.to_dict()}}
    assert schema.remove_metadata() == expected.arrow_schema.remove_metadata()


def test_datasets_reads_the_labels_as_class_labels(tmp_path, hf_datasets):
    path = tmp_path / "gold.parquet"
    write_parquet(ITEMS, LABELS, ANNOTATORS, path)
    ds = hf_datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(tmp_path / "hf" / "datasets"))["train"]

    assert ds.features == _features(hf_datasets)
    label = ds.features["label"]
    assert isinstance(label, hf_datasets.ClassLabel) and label.names == list(LABELS)
    assert ds["row"] == [2, 4, 5, 7]
    assert ds["text"] == [it.text for it in IN_ORDER]
    assert ds["label"] == [2, -1, -1, 1]
    assert [None if k < 0 else label.int2str(k) for k in ds["label"]] == [it.gold for it in IN_ORDER]
    assert ds["label_name"] == [it.gold for it in IN_ORDER]
    assert all(label.str2int(label.int2str(k)) == k for k in range(len(LABELS)))
    assert ds["answer_ana"] == [0, 0, -1, 1]
    assert ds["answer_bo@example.org"] == [-1, 1, -1, 1]
    assert ds["answer_çé"] == [2, -1, -1, -1]
    assert ds["reviewed"] == [2, -1, -1, -1] and ds["reviewer"] == ["rev", None, None, None]
    assert ds["n_answers"] == [2, 2, 0, 2]
    assert ds["source"] == ["mail", None, None, "web"] and ds["score"] == [2.0, None, None, 1.5]
    assert ds["tags"] == [None, None, '["a", "b"]', None]  # lists are kept as JSON text


def test_pandas_reads_the_parquet(tmp_path):
    path = tmp_path / "gold.parquet"
    write_parquet(ITEMS, LABELS, ANNOTATORS, path, text_column="message")
    frame = pd.read_parquet(path)
    assert list(frame.columns[:4]) == ["row", "message", "label", "label_name"]
    assert frame["message"].tolist() == [it.text for it in IN_ORDER]
    assert frame["label"].tolist() == [2, -1, -1, 1]
    assert frame["answer_çé"].dtype == "int64"
    assert not (tmp_path / "gold.parquet.partial").exists()


# A JSON schema of the import format Label Studio documents (https://labelstud.io/guide/tasks.html#Basic-
# Label-Studio-JSON-format: a list of tasks, each with `data` and optional `annotations`; an annotation's
# fields from https://labelstud.io/guide/task_format.html; `completed_by` as the importer reads it: a
# user id or {"email": ...}), narrowed to a Choices control over a Text object.
LABEL_STUDIO_IMPORT = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "object", "required": ["text"]},
            "meta": {"type": "object"},
            "annotations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["result"],
                    "additionalProperties": False,
                    "properties": {
                        "result": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["from_name", "to_name", "type", "value"],
                                "properties": {
                                    "id": {"type": "string"},
                                    "from_name": {"type": "string"},
                                    "to_name": {"type": "string"},
                                    "type": {"const": "choices"},
                                    "value": {
                                        "type": "object",
                                        "required": ["choices"],
                                        "properties": {"choices": {"type": "array", "items": {"type": "string"},
                                                                   "minItems": 1}},
                                    },
                                },
                            },
                        },
                        "ground_truth": {"type": "boolean"},
                        "was_cancelled": {"type": "boolean"},
                        "lead_time": {"type": "number"},
                        "completed_by": {"oneOf": [
                            {"type": "integer"},
                            {"type": "object", "required": ["email"], "properties": {"email": {"type": "string"}}},
                        ]},
                    },
                },
            },
        },
    },
}


def _config_choices(xml: str, from_name="label", to_name="text", text_column="text") -> list[str]:
    """The config's Choice values, once its tags are known to fit the tasks."""
    view = ElementTree.fromstring(xml)
    assert view.tag == "View"
    (text,) = view.findall("Text")
    (choices,) = view.findall("Choices")
    assert text.attrib == {"name": to_name, "value": f"${text_column}"}
    assert choices.get("name") == from_name and choices.get("toName") == to_name
    return [c.get("value") for c in choices.findall("Choice")]


def test_label_studio_tasks_follow_the_import_format(tmp_path):
    import jsonschema

    path = tmp_path / "tasks.json"
    assert write_label_studio(ITEMS, LABELS, path, emails={"ana": "ana@example.org"}) == 4
    tasks = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.validate(tasks, LABEL_STUDIO_IMPORT)
    choices = _config_choices(label_studio_config(LABELS))
    assert choices == list(LABELS)

    assert [t["data"]["row"] for t in tasks] == [2, 4, 5, 7]
    for task, item in zip(tasks, IN_ORDER):
        assert task["data"] == {"text": item.text, "row": item.row, **item.extra}
        annotations = task["annotations"]
        assert len(annotations) == len(item.answers) + (item.reviewed is not None)
        for annotation in annotations:
            (result,) = annotation["result"]
            assert (result["from_name"], result["to_name"]) == ("label", "text")
            assert set(result["value"]["choices"]) <= set(choices)
        given = [a["result"][0]["value"]["choices"] for a in annotations]
        assert given == [[v] for v in item.answers.values()] + ([[item.reviewed]] if item.reviewed else [])
        # only the reviewer's is the ground truth (the importer takes a missing flag as true)
        assert [a["ground_truth"] for a in annotations] == [False] * len(item.answers) + [True] * (item.reviewed is not None)
        assert task["meta"]["annotated_by"] == [*item.answers, *(["rev"] if item.reviewed else [])]
        assert task["meta"]["gold"] == item.gold

    by_row = {t["data"]["row"]: t for t in tasks}
    # emails from `emails` or a name that is one; none for the others (assigned to the importer)
    assert [a.get("completed_by") for a in by_row[7]["annotations"]] == [{"email": "bo@example.org"},
                                                                        {"email": "ana@example.org"}]
    assert [a.get("completed_by") for a in by_row[2]["annotations"]] == [{"email": "ana@example.org"}, None, None]
    assert by_row[5]["annotations"] == []


def test_label_studio_keeps_unicode_and_quotes(tmp_path):
    path = tmp_path / "tasks.json"
    write_label_studio(ITEMS, LABELS, path, text_column="message", from_name="sentiment", to_name="msg")
    raw = path.read_text(encoding="utf-8")
    assert "naïve café 🙂" in raw  # written as UTF-8, not \u escapes
    tasks = json.loads(raw)
    assert tasks[-1]["data"]["message"] == 'He said "ok" — naïve café 🙂'
    assert tasks[0]["annotations"][-1]["result"][0] == {
        "from_name": "sentiment", "to_name": "msg", "type": "choices", "value": {"choices": [LABELS[2]]}}
    xml = label_studio_config(LABELS, text_column="message", from_name="sentiment", to_name="msg")
    assert _config_choices(xml, "sentiment", "msg", "message") == list(LABELS)
    assert "&quot;other&quot; &lt;one&gt; &amp; more" in xml


def test_no_items_are_refused(tmp_path):
    """Neither reader takes an empty file (`datasets`: "corresponds to no data"; Label Studio: "empty")."""
    with pytest.raises(InputError, match="nothing to export"):
        write_parquet([], LABELS, ANNOTATORS, tmp_path / "gold.parquet")
    with pytest.raises(InputError, match="nothing to export"):
        write_label_studio([], LABELS, tmp_path / "tasks.json")
    assert list(tmp_path.iterdir()) == []


def _item(**changes) -> LabelledItem:
    return LabelledItem(**{**dict(row=0, text="t", answers={"ana": "positive"}, reviewer=None, reviewed=None,
                                  gold="positive", extra={}), **changes})


@pytest.mark.parametrize(("items", "error", "message"), [
    ([_item(answers={"ana": "maybe"})], TaskError, "row 0: ana gave 'maybe', which is not a label"),
    ([_item(gold="maybe")], TaskError, "row 0: the gold is 'maybe'"),
    ([_item(reviewer="rev", reviewed="maybe")], TaskError, "row 0: the reviewer gave 'maybe'"),
    ([_item(answers={"dave": "positive"})], TaskError, "row 0: 'dave' answered but is not one of the annotators"),
    ([_item(), _item()], InputError, "row 0 is given twice"),
    ([_item(extra={"label": "old"})], InputError, "row 0: the input column 'label' has the name of a column"),
])
def test_parquet_refuses_items_that_do_not_fit(tmp_path, items, error, message):
    path = tmp_path / "gold.parquet"
    with pytest.raises(error, match=message.replace("(", r"\(")):
        write_parquet(items, LABELS, ANNOTATORS, path)
    assert not path.exists() and not (tmp_path / "gold.parquet.partial").exists()


def test_label_studio_refuses_what_it_cannot_import(tmp_path):
    path = tmp_path / "tasks.json"
    with pytest.raises(InputError, match="row 0: .*JSON values"):
        write_label_studio([_item(extra={"when": float("nan")})], LABELS, path)
    with pytest.raises(InputError, match="'row' has the name of a column"):
        write_label_studio([_item(extra={"row": 3})], LABELS, path)
    with pytest.raises(FieldError, match="text_column must be letters"):
        write_label_studio([_item()], LABELS, path, text_column="the text")
    with pytest.raises(TaskError, match="named twice"):
        label_studio_config(["a", "a"])
    assert not path.exists()
