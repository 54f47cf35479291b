"""OpCalls: records the calls of torch.ops.paged_attn.<name>, through the packet or any of its
overloads (the integrations name `.default`), for the tests that check a model's steps went
through the ops. A monkeypatched attribute, not a dispatch mode: transformers' continuous
batching runs the model on a thread of its own, where a thread-local mode would see nothing."""

import torch


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

    @property
    def count(self):
        return len(self.calls)
