"""The lake: the folder store (`store`), its Iceberg tables (`tables`), their maintenance, the conversion of the
layout of before Iceberg (`migration`) and the `lake` commands.

Its modules import downward only: `files` (URIs, file systems) and `locks` import nothing of the lake, `listing`
(listing and deleting without following links) imports `files`, `tables` imports `files`, `store` imports both,
`maintenance`, `migration` and `commands` sit on top.
"""
