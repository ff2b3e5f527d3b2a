"""Through the real webserver and daemon on loopback, as the UI drives them: GraphQL in, a real run out."""

import time

from dagster_dev import LOCATION, REPOSITORY, dagster_dev, gql  # noqa: F401 (fixture)
from imagefactory import write_batch


def test_materialize_from_the_ui_api_and_read_results_back(dagster_dev):  # noqa: F811 (the fixture)
    url, lake = dagster_dev
    write_batch(lake / "landing", "ui-batch", bad=False)
    repository = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}

    added = gql(
        url,
        """mutation($repo: RepositorySelector!, $key: String!) {
        addDynamicPartition(repositorySelector: $repo, partitionsDefName: "image_batches", partitionKey: $key) {
          __typename ... on PythonError { message } } }""",
        repo=repository,
        key="ui-batch",
    )
    assert added["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", added

    # What the UI's Materialize button sends for one partition of raw_images and its checks.
    launched = gql(
        url,
        """mutation($params: ExecutionParams!) {
        launchPipelineExecution(executionParams: $params) {
          __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
          ... on RunConfigValidationInvalid { errors { message } } } }""",
        params={
            "selector": {
                **repository,
                "pipelineName": "__ASSET_JOB",
                "assetSelection": [{"path": ["raw_images"]}],
                "assetCheckSelection": [{"assetKey": {"path": ["raw_images"]}, "name": "valid_image_share"}],
            },
            "mode": "default",
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "ui-batch"}]},
        },
    )
    assert launched["launchPipelineExecution"]["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["launchPipelineExecution"]["run"]["runId"]

    deadline, status = time.time() + 420, None
    while time.time() < deadline:  # queued -> the daemon dequeues -> a run worker process executes it
        query = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
        status = gql(url, query, id=run_id)["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(3)
    assert status == "SUCCESS", status

    asset = gql(
        url,
        """{ assetOrError(assetKey: {path: ["raw_images"]}) { ... on Asset {
        assetMaterializations(limit: 1) { partition runId metadataEntries { label
          ... on IntMetadataEntry { intValue } } } } } }""",
    )["assetOrError"]
    materialization = asset["assetMaterializations"][0]
    assert materialization["partition"] == "ui-batch" and materialization["runId"] == run_id
    values = {e["label"]: e.get("intValue") for e in materialization["metadataEntries"]}
    assert values["files_listed"] == 20 and values["valid"] == 20

    checks = gql(
        url,
        """{ assetNodes(assetKeys: [{path: ["raw_images"]}]) { assetChecksOrError {
        ... on AssetChecks { checks { name executionForLatestMaterialization { status runId } } } } } }""",
    )
    by_name = {c["name"]: c["executionForLatestMaterialization"] for c in checks["assetNodes"][0]["assetChecksOrError"]["checks"]}
    assert by_name["valid_image_share"]["status"] == "SUCCEEDED"
    assert by_name["valid_image_share"]["runId"] == run_id
