"""The TrainingJob spec: typed models, YAML loading and readable validation errors."""

from tailcut.spec.load import from_dict, load_file, load_text
from tailcut.spec.model import JobSpec, Link, TrainingJob

__all__ = ["JobSpec", "Link", "TrainingJob", "from_dict", "load_file", "load_text"]
