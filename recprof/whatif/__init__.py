"""`recprof whatif`: predict a knob's effect on the step from one capture, before running it."""
