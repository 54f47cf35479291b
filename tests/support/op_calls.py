"""OpCalls: records the calls of torch.ops.paged_attn.<name>, through the packet or any of its
overloads (the integrations name `.default`), for the tests that check a model's steps went
through the ops. A monkeypatched attribute, not a dispatch mode: transformers' continuous
batching runs the model on a thread of its own, where a thread-local mode would see nothing.
The package's own callers (op_args.caller: the API, vllm_compat, the integrations) look the op's
overloads up once and keep them; OpCalls makes them look up the counting ones while it is active
and gives them back what they held when the test ends."""

import torch

from paged_attention_ext import op_args


class _CountingPacket:
    def __init__(self, packet, counting):
        self._packet_call = counting(packet)
        for overload in packet.overloads():
            setattr(self, overload, counting(getattr(packet, overload)))

    def __call__(self, *args, **kwargs):
        return self._packet_call(*args, **kwargs)


class OpCalls:
    """calls: record(*args) of every call, in order (record's default keeps nothing)."""

    def __init__(self, monkeypatch, name, record=lambda *args: None):
        self.calls = []

        def counting(op):
            def counted(*args, **kwargs):
                self.calls.append(record(*args))
                return op(*args, **kwargs)
            return counted

        packet = getattr(torch.ops.paged_attn, name)
        monkeypatch.setattr(torch.ops.paged_attn, name, _CountingPacket(packet, counting))
        # The callers' looked-up overloads: the caller's namespace (its function globals) and
        # op_args' table, restored by monkeypatch at the end.
        monkeypatch.setitem(op_args.caller(name).__globals__, "_choices", None)
        monkeypatch.setitem(op_args._BY_TENSOR_SCALES, name, None)

    @property
    def count(self):
        return len(self.calls)
