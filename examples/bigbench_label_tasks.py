"""The held-out BIG-bench tasks of the labelling simulation, from the `bigbench==1.0.0` source package.

    .venv/bin/python examples/bigbench_label_tasks.py bigbench-1.0.0.tar.gz OUT_DIR [--max 1000]

The source package is the one the intent data set comes from (its `intent_recognition/task.json`
is byte-identical to `../shared/data/intent_recognition.json`). `pip download bigbench==1.0.0`
refuses it (a direct-URL dependency); fetch the file through pip's own HTTP client instead:

    .venv/bin/python -c "from pip._internal.network.session import PipSession as S; s = S(); \\
      j = s.get('https://pypi.org/simple/bigbench/', headers={'Accept': 'application/vnd.pypi.simple.v1+json'}).json(); \\
      u = [f['url'] for f in j['files'] if f['filename'] == 'bigbench-1.0.0.tar.gz'][0]; \\
      open('bigbench-1.0.0.tar.gz', 'wb').write(s.get(u).content)"

Writes OUT_DIR/<task>.json for each task of the list the issue allows (the other BIG-bench tasks are
kept for an independent check); `fact_checker` is three subtasks, written as three files. A task of
more than `--max` examples keeps a seeded random sample of `--max` (the same every run), in the
file's order; every other field is the task's own.
"""

import argparse
import json
import random
import tarfile
from pathlib import Path

TASKS = ("vitaminc_fact_verification", "epistemic_reasoning", "metaphor_boolean", "presuppositions_as_nli",
         "logical_fallacy_detection", "anachronisms", "misconceptions", "entailed_polarity",
         "fact_checker/covid19_scientific", "fact_checker/fever", "fact_checker/politifact")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist")
    parser.add_argument("out")
    parser.add_argument("--max", type=int, default=1000)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.sdist) as tar:
        for task in TASKS:
            member = tar.extractfile(f"bigbench-1.0.0/bigbench/benchmark_tasks/{task}/task.json")
            data = json.loads(member.read())
            examples = data["examples"]
            if len(examples) > args.max:
                keep = sorted(random.Random(0).sample(range(len(examples)), args.max))
                data["examples"] = [examples[i] for i in keep]
            name = task.replace("/", "_")
            (out / f"{name}.json").write_text(json.dumps(data, ensure_ascii=False))
            print(f"{name}: {len(data['examples'])} of {len(examples)} examples")


if __name__ == "__main__":
    main()
