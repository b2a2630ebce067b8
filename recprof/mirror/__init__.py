"""`recprof mirror`: shape the built-in trainer like a captured job, so `recprof tune` answers
for that job. `shape` reads the model's shape off the trace's operator shapes, `derive` turns
shape and analysis into a trainer config with where each value came from, `calibrate` fits the
dense widths to the captured dense time with real runs of the trainer.
"""
