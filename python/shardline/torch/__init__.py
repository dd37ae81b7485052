"""PyTorch on Shardline: a torch.distributed Store and torchrun's rendezvous.

    import torch.distributed as dist
    from shardline.torch import Store
    store = Store(member)                       # a shardline.member.Member
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)

The torchrun rendezvous backend is shardline.torch.rendezvous (run
`python3 -m shardline.torchrun ...`; see that module).
"""

from shardline.torch.store import Store  # noqa: F401

__all__ = ["Store"]
