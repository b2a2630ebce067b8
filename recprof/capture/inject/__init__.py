"""The folder `recprof capture` prepends to the job's PYTHONPATH; it holds only the injected
`sitecustomize`. It is a package only so that a wheel ships that file."""
