"""The flows that chain the layers, in one place: capture -> analyze -> predict -> report ->
compare.

- `capture`: `recprof capture`: run the job under the recorder, then what follows;
- `after_capture`: a run folder's traces analysed once, the findings' knobs predicted, the
  document and the report written;
- `windows`: each on-demand window analysed, reported and compared with the reference window;
- `report`: `recprof report`: an input opened, predicted and rendered.

The layers below never call each other upwards; what needs several of them is here.
"""
