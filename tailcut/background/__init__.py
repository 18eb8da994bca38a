"""Background load: other applications' traffic on a job's links, driven by Locust."""
