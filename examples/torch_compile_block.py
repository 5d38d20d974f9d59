"""A transformer-style block on xgemm under torch.compile(fullgraph=True), checked against eager torch.

    python examples/torch_compile_block.py

Single-head attention (xgemm.matmul for the projections and x @ v, xgemm.gemm with alpha=1/sqrt(d)
for q @ k^T, xgemm.softmax) and a ReLU MLP (xgemm.gemm adding the bias) compile as one graph:
each xgemm call is one opaque torch.library op (`torch.ops.xgemm.*`) that the compiler keeps,
with a fake implementation for tracing (a recording backend counts them in the captured graph).
The forward and the gradients (through xgemm's autograd formulas) of the default (inductor)
compile are compared with the same block written with torch.matmul / torch.softmax. Runs on CUDA
when torch sees a GPU, else on the CPU; exits non-zero on a mismatch.
"""
import math
import sys

try:
    import torch
except ImportError:
    print("skipped: needs torch")
    sys.exit(0)

import xgemm

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
B, T, D, F = 2, 32, 64, 128


class Block(torch.nn.Module):
    def __init__(self, mm, gemm, softmax):
        super().__init__()
        self.mm, self.gemm, self.softmax = mm, gemm, softmax
        init = lambda *s: torch.nn.Parameter(torch.randn(*s) / math.sqrt(s[0]))
        self.wq, self.wk, self.wv, self.wo = (init(D, D) for _ in range(4))
        self.w1, self.w2 = init(D, F), init(F, D)
        self.b1 = torch.nn.Parameter(torch.zeros(F))

    def forward(self, x):
        q, k, v = self.mm(x, self.wq), self.mm(x, self.wk), self.mm(x, self.wv)
        scores = self.gemm(q, k.transpose(-1, -2), alpha=1 / math.sqrt(D))
        x = x + self.mm(self.mm(self.softmax(scores, axis=-1), v), self.wo)
        return x + self.mm(torch.relu(self.gemm(x, self.w1, self.b1, beta=1.0)), self.w2)


def torch_gemm(a, b, c=None, alpha=1.0, beta=0.0):
    return alpha * torch.matmul(a, b) + (beta * c if c is not None else 0)


xgemm_block = Block(xgemm.matmul, xgemm.gemm, xgemm.softmax).to(dev)
torch_block = Block(torch.matmul, torch_gemm, lambda s, axis: torch.softmax(s, dim=axis)).to(dev)
torch_block.load_state_dict(xgemm_block.state_dict())

compiled = torch.compile(xgemm_block, fullgraph=True)
x = torch.randn(B, T, D, device=dev)
x_ref = x.clone().requires_grad_()
x = x.requires_grad_()

out = compiled(x)
ref = torch_block(x_ref)
torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
print(f"forward on {dev}: max |diff| vs eager torch {(out - ref).abs().max().item():.1e}")

out.square().mean().backward()
ref.square().mean().backward()
torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
for (name, p), p_ref in zip(xgemm_block.named_parameters(), torch_block.parameters()):
    torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
print(f"backward: grads of x and {len(list(xgemm_block.parameters()))} parameters match eager torch")

# a second call with new values reuses the compiled graph (under torch.no_grad() it would compile
# an inference graph once more)
x2 = torch.randn(B, T, D, device=dev, requires_grad=True)   # as x: the same guards
torch.testing.assert_close(compiled(x2), torch_block(x2), rtol=1e-4, atol=1e-4)

# what dynamo captured, seen by a backend that records the graph and runs it as it is: one graph
# (fullgraph=True) in which each xgemm call is one torch.ops.xgemm op
captured = []


def recording(gm, example_inputs):
    captured.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return gm.forward


torch.compile(xgemm_block, backend=recording, fullgraph=True)(x2)
ops = {op: captured.count(op) for op in ("xgemm.gemm.default", "xgemm.softmax.default")}
print(f"the graph: {len(captured)} calls, {ops['xgemm.gemm.default']} xgemm.gemm and "
      f"{ops['xgemm.softmax.default']} xgemm.softmax ops")
assert ops == {"xgemm.gemm.default": 8, "xgemm.softmax.default": 1}, captured
print("ok")
