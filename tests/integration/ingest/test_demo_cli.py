"""What a CLI user of `make demo` sees when a blocking check holds a batch back: the check's what-to-fix text,
not a Dagster stack trace."""

import io
import re

import dagster as dg
from imagefactory import write_mostly_corrupt_batch

from dgx_assets.demo import DemoProgress, _DemoOutcome, execute_for_cli
from dgx_assets.ingest.assets import raw_images
from dgx_assets.ingest.checks import raw_image_checks
from dgx_assets.partitions import image_batches
from dgx_assets.resources import LakeResource

FIX = "Only 14.3% of batch bad decoded as images (at least 80% needed)"


def _bad_batch_defs(tmp_path, spark_resource) -> dg.Definitions:
    lake_root = tmp_path / "lake"
    write_mostly_corrupt_batch(lake_root / "landing")

    @dg.asset(partitions_def=image_batches, deps=[raw_images])
    def image_features_stand_in():
        return None

    return dg.Definitions(
        assets=[raw_images, image_features_stand_in],
        asset_checks=raw_image_checks,
        resources={"spark": spark_resource, "lake": LakeResource(root=str(lake_root))},
    )


def test_a_blocking_check_that_holds_a_batch_back_shows_what_to_fix_not_a_stack_trace(tmp_path, spark_resource, capfd):
    defs = _bad_batch_defs(tmp_path, spark_resource)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(image_batches.name, ["bad"])
        capfd.readouterr()
        result = execute_for_cli(defs.resolve_implicit_global_asset_job_def(), instance, partition_key="bad")
        outcome = _DemoOutcome()
        outcome.add(instance, result, "batch bad")
    printed = capfd.readouterr()
    console = printed.out + printed.err
    fix = FIX
    assert not result.success and not result.asset_materializations_for_node("image_features_stand_in")
    assert "STEP_FAILURE" in console and "A blocking check held it back. raw_images:valid_image_share: " + fix in console
    assert "Stack Trace" not in console and "DagsterAssetCheckFailedError" not in console
    assert outcome.errors == [] and len(outcome.gates) == 1
    assert outcome.gates[0].startswith("batch bad: raw_images:valid_image_share: " + fix)


def test_the_demo_console_shows_one_line_per_step_and_the_event_log_goes_to_a_file(tmp_path, spark_resource, capfd):
    defs = _bad_batch_defs(tmp_path, spark_resource)
    console, log_path = io.StringIO(), tmp_path / "demo.log"
    with dg.instance_for_test() as instance, open(log_path, "w") as log_file:
        instance.add_dynamic_partitions(image_batches.name, ["bad"])
        capfd.readouterr()
        progress = DemoProgress(console)  # not a terminal: lines only, no bars
        progress.header("batch bad")
        result = execute_for_cli(
            defs.resolve_implicit_global_asset_job_def(), instance, progress=progress, log_file=log_file, partition_key="bad"
        )
    assert not result.success
    lines = console.getvalue().splitlines()
    step_line = re.compile(r"^  (\S+) +(ok|held back|skipped|FAILED) +\d+\.\d s$")
    steps = {m.group(1): m.group(2) for m in map(step_line.match, lines) if m}
    assert steps, console.getvalue()
    assert steps["raw_images"] == "ok" and steps["raw_images_valid_image_share"] == "held back"
    assert steps["raw_images_image_bounds"] == "ok"
    assert f"\n      what to fix: raw_images:valid_image_share: {FIX}" in console.getvalue(), console.getvalue()
    assert "DEBUG" not in console.getvalue() and "STEP_START" not in console.getvalue()
    printed = capfd.readouterr()
    assert "STEP_START" not in printed.out + printed.err  # nothing of Dagster's log reaches the terminal
    log = log_path.read_text()
    assert log.count("STEP_START") >= 4 and "DEBUG" in log and "A blocking check held it back." in log


def test_progress_bars_follow_spark_tasks_and_epochs():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    progress = DemoProgress(Terminal())
    start = dg.DagsterEvent(dg.DagsterEventType.STEP_START.value, "__job__", step_key="trained_model")
    progress.event("trained_model", start, "started")
    progress.event("trained_model", None, "Spark: stage 3 (parquet): 5/12 tasks done, 2 running, 0 failed")
    assert (progress._bar.n, progress._bar.total, progress._bar.unit) == (5, 12, "tasks")
    progress.event("trained_model", None, "__job__ - 1234 - trained_model - epoch 2: accuracy=0.8100, loss=0.4000")
    assert (progress._bar.n, progress._bar.unit) == (3, "epochs") and "loss=0.4000" in str(progress._bar)
    progress.event("trained_model", None, "No generator in /x: training one now (a few minutes on a CPU)")
    assert "building the local generator" in progress._bar.desc
    from dagster._core.execution.plan.objects import StepSuccessData

    done = dg.DagsterEvent(
        dg.DagsterEventType.STEP_SUCCESS.value,
        "__job__",
        step_key="trained_model",
        event_specific_data=StepSuccessData(duration_ms=1.0),
    )
    progress.event("trained_model", done, "finished")
    assert progress._bar is None and re.search(r"  trained_model +ok +\d+\.\d s\n", progress.stream.getvalue())


def test_libraries_output_goes_to_the_log_file_and_the_console_keeps_the_step_lines(tmp_path, capfd):
    import os
    import sys

    from dgx_assets.demo import _output_into

    log_path = tmp_path / "demo.log"
    with open(log_path, "a") as log_file, _output_into(log_file) as console:
        os.write(1, b"1/1 keras step bar\n")  # what Keras, TensorFlow and the Spark JVM write past Python
        os.write(2, b"I0000 oneDNN custom operations are on\n")
        print("Successfully registered model 'x'.")
        sys.stdout.flush()
        console.write("  trained_model    ok    12.0 s\n")
    printed = capfd.readouterr()
    assert printed.out == "  trained_model    ok    12.0 s\n" and printed.err == ""
    log = log_path.read_text()
    assert "keras step bar" in log and "oneDNN" in log and "Successfully registered model" in log
    print("after")  # the process's own stdout is back
    assert capfd.readouterr().out == "after\n"
