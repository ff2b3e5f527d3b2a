"""The `generation` group: ernie_generated_images and its checks, and the ERNIE-Image serving resource."""
