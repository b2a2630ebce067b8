"""`recprof view`: open a capture in TensorBoard's PyTorch Profiler plugin (torch-tb-profiler).

recprof answers the job-level questions (where the step goes, which collective, which rank);
the plugin answers the op-level ones (which operator, which kernel, the trace itself). This
package lays a capture out the way the plugin reads it and serves it.
"""
