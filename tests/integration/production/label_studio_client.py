"""Drives a running Label Studio through label-studio-sdk, as a reviewer's session would: run with the Python of
the venv Label Studio is installed in (the sdk does not install into the project's venv under constraints.txt).

    python label_studio_client.py PLAN.json

PLAN: {"url", "token", "queue" (a review queue folder), "labels" ({sha256: class}), "cancel" ([sha256]), "out"}.
Checks the queue's config and tasks against the sdk's own validators, creates a project with the config,
imports tasks.json, annotates each task (a cancelled annotation for `cancel`), exports JSON, JSON_MIN and CSV
into `out`, and prints what it did as one JSON object.
"""

import json
import sys
from pathlib import Path

from label_studio_sdk import LabelStudio
from label_studio_sdk.label_interface import LabelInterface

EXPORTS = {"JSON": "export.json", "JSON_MIN": "export_min.json", "CSV": "export.csv"}


def sdk_problems(config: str, tasks: list[dict]) -> list[str]:
    interface = LabelInterface(config)
    interface.validate()  # raises on a config Label Studio refuses
    problems = []
    for number, task in enumerate(tasks, 1):
        if not interface.validate_task({"data": task["data"]}):
            problems.append(f"task {number}: its data misses a variable of the config")
        for prediction in task["predictions"]:
            problems += [f"task {number}: {error}" for error in interface.validate_prediction(prediction, return_errors=True)]
    return problems


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    queue, out = Path(plan["queue"]), Path(plan["out"])
    config = (queue / "labeling_config.xml").read_text()
    tasks = json.loads((queue / "tasks.json").read_text())
    report: dict = {"sdk_problems": sdk_problems(config, tasks)}

    client = LabelStudio(base_url=plan["url"], api_key=plan["token"])
    project = client.projects.create(title="review queue", label_config=config)
    assert project.id is not None
    imported = client.projects.import_tasks(project.id, request=tasks, return_task_ids=True)
    report["imported"] = imported.task_count
    stored = list(client.tasks.list(project=project.id, fields="all"))
    report["stored"] = [{"data": task.data, "predictions": [p.score for p in task.predictions or []]} for task in stored]
    for task in stored:
        sha256 = task.data["sha256"]
        if sha256 in plan["cancel"]:  # skipped, as the UI's Skip button sends it
            client.annotations.create(task.id, result=[], was_cancelled=True)
            continue
        value = {"choices": [plan["labels"][sha256]]}
        client.annotations.create(
            task.id, result=[{"from_name": "choice", "to_name": "image", "type": "choices", "value": value}]
        )
    for kind, name in EXPORTS.items():
        data = b"".join(client.projects.exports.download_sync(project.id, export_type=kind, download_all_tasks=True))
        (out / name).write_bytes(data)
    report["exports"] = {kind: str(out / name) for kind, name in EXPORTS.items()}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
