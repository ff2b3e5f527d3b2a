"""The lake: the folder store (`store`), its Iceberg tables (`tables`), their maintenance and the `lake` commands.

Its modules import downward only: `files` (URIs, file systems, listings) and `locks` import nothing of the lake,
`tables` imports `files`, `store` imports both, `maintenance` and `commands` sit on top.
"""
