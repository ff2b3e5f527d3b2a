"""The operator's tools for the stations: fetch a registered edge model (verified by its sha256) and write the
KubeEdge Deployment that serves it (`edge-fetch`, `edge-manifest`)."""
