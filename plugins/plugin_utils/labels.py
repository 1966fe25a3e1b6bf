"""Names that raymetal's label filters share (plugins/filter/ray_labels.py, plugins/filter/ray_cluster.py)."""

# raymetal's own node labels; ray.io/ is Ray's.
PREFIX = "raymetal.io/"
# Ray's topology label for the NVLink domain (topology-aware placement groups).
GPU_DOMAIN = "ray.io/gpu-domain"
