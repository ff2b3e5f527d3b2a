"""What a CLI user of `make demo` sees when a blocking check holds a batch back: the check's what-to-fix text,
not a Dagster stack trace."""

import io
import re
import time

import dagster as dg
from imagefactory import write_mostly_corrupt_batch

from dgx_assets.defs.ingest.assets import raw_images
from dgx_assets.defs.ingest.checks import raw_image_checks
from dgx_assets.defs.resources import LakeResource, SparkResource
from dgx_assets.demo import _DemoOutcome, execute_for_cli
from dgx_assets.demo_console import DemoProgress
from dgx_assets.partitions import image_batches

FIX = "14.3% of batch bad decoded as images (at least 80% needed). To fix: See `status`/`reason` in raw_images"


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


def test_progress_bars_follow_the_structured_progress_of_a_real_run(spark_resource):
    """Spark tasks, epochs and phases reach the bar as structured records through Dagster's loggers; a message
    that only reads like progress moves nothing."""
    from dgx_assets.progress import log_progress
    from dgx_assets.spark.progress import spark_progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def slow(rows):
        for row in rows:
            time.sleep(0.4)
            yield row

    @dg.asset
    def long_step(context: dg.AssetExecutionContext, spark: SparkResource) -> None:
        session = spark.spark_session
        with spark_progress(session, context.log.info, every_seconds=0.2):
            session.sparkContext.parallelize(range(6), 3).mapPartitions(slow).count()
        log_progress(context.log.info, "epoch 2: loss=0.4000", "epoch", epoch=2, metrics={"loss": 0.4})
        context.log.info("epoch 9: accuracy=0.1000 (text alone)")
        log_progress(context.log.info, "building", "phase", phase="building the local generator")
        time.sleep(1.2)  # the bar's ticker redraws the phase

    terminal = Terminal()
    progress = DemoProgress(terminal)
    job = dg.Definitions(assets=[long_step], resources={"spark": spark_resource}).resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        result = execute_for_cli(job, instance, progress=progress)
    assert result.success
    drawn = terminal.getvalue()
    assert re.search(r"\d/3 Spark tasks", drawn), drawn
    assert "epoch 2 done" in drawn and "loss=0.4000" in drawn
    assert "epoch 9" not in drawn and "accuracy=0.1000" not in drawn
    assert "building the local generator" in drawn
    assert progress._bar is None and re.search(r"  long_step +ok +\d+\.\d s\n", drawn)


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


def test_a_held_back_promotion_reads_held_back_with_its_reason_and_the_run_goes_on(tmp_path):
    outcome_text = "m v1 not promoted, stays candidate; the champion stays none"
    reason = "**edge_model.parity** failed: int8 ships: 15 flips"

    @dg.asset(name="champion_model")  # champion_model's contract: its decision in its metadata
    def decision() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            metadata={"decision": "held back", "outcome": outcome_text, "reason": dg.MetadataValue.md(reason)}
        )

    @dg.asset(deps=[decision])
    def quality_report() -> None:
        return None

    console = io.StringIO()
    job = dg.Definitions(assets=[decision, quality_report]).resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance, open(tmp_path / "demo.log", "w") as log_file:
        result = execute_for_cli(job, instance, progress=DemoProgress(console), log_file=log_file)
        outcome = _DemoOutcome()
        outcome.add(instance, result, "whole-dataset assets")
    assert result.success and result.asset_materializations_for_node("quality_report")
    lines = console.getvalue().splitlines()
    assert re.match(r"^  champion_model +held back +\d+\.\d s$", lines[0]), lines
    assert lines[1] == f"      what to fix: {outcome_text}. {reason}." and re.match(r"^  quality_report +ok ", lines[2])
    assert outcome.errors == [] and outcome.gates == [f"whole-dataset assets: champion_model: {outcome_text}. {reason}."]


def test_a_failed_warning_check_reads_warning_with_what_it_found(tmp_path):
    found = "The generated images are near-duplicates: mean pairwise distance 0.039 (at least 0.1)"

    @dg.asset
    def generated() -> None:
        return None

    @dg.asset_check(asset=generated)
    def diverse() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, description=found)

    @dg.asset_check(asset=generated)
    def decodes() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN, description="12 of 12")

    console = io.StringIO()
    job = dg.Definitions(assets=[generated], asset_checks=[diverse, decodes]).resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance, open(tmp_path / "demo.log", "w") as log_file:
        result = execute_for_cli(job, instance, progress=DemoProgress(console), log_file=log_file)
    assert result.success
    text = console.getvalue()
    assert re.search(r"^  generated_diverse +warning +\d+\.\d s\n      " + re.escape(found) + "$", text, re.M), text
    assert re.search(r"^  generated_decodes +ok +\d+\.\d s$", text, re.M) and "what to fix" not in text, text
