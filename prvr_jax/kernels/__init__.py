"""CPU-tuned kernels, each beside the plain operation it replaces (docs/kernels.md).

* `dropout`: `nn.Dropout` with 16 random bits per element, drawn in one fused pass.
* `layer_norm`: `nn.LayerNorm` with a hand-written backward pass.
* `branches`: `x + y` and the dense products of GMMBlock's parallel branches over one shared
  input, with batching rules that keep its gradient free of a sum over the branch axis.

The layers are written with the plain `nn.Dropout` and `nn.LayerNorm`; `policy.fast_kernels()`
puts the first two kernels in their place (the train step enters it, by backend). The branch
rules are batching rules of operations, written into the layers that own those operations.
"""
