"""Weight transports: what the actor sends is what the rollout receives, whole, by every path."""

from __future__ import annotations

import pytest
import torch

from verl.workers.weight_transport import IN_PROCESS, Filesystem, Parcel, transport_of, weight_transport


def weights() -> dict[str, torch.Tensor]:
    embed = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    return {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "norm.weight": torch.ones(4)}


def assert_same(received, sent: dict[str, torch.Tensor]) -> None:
    received = dict(received)
    assert sorted(received) == sorted(sent)
    for name, tensor in sent.items():
        assert torch.equal(received[name], tensor), name


def test_in_process_streams_the_tensors_and_counts_them_as_they_pass():
    sent = weights()
    parcel = IN_PROCESS.send(iter(sent.items()), version=3)
    assert parcel.megabytes == 0  # nothing has passed yet: the tensors are not copied up front
    assert_same(IN_PROCESS.receive(parcel), sent)
    assert parcel.megabytes == sum(t.numel() * 4 for t in sent.values()) / 1e6
    assert transport_of(parcel) is not None and parcel.version == 3


def test_files_are_whole_and_only_the_newest_version_stays(tmp_path):
    sent = weights()
    sender = weight_transport("filesystem", str(tmp_path))
    first = sender.send(sent.items(), version=1)
    second = sender.send({k: v + 1 for k, v in sent.items()}.items(), version=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy_v1.safetensors", "policy_v2.safetensors"]
    assert_same(transport_of(first).receive(first), sent)  # tied tensors survive as two names
    transport_of(second).discard(second)
    assert [p.name for p in tmp_path.iterdir()] == ["policy_v2.safetensors"]
    assert second.megabytes == first.megabytes > 0


def test_the_object_store_hands_every_reader_the_same_tensors(ray_session):
    sent = weights()
    parcel = weight_transport("object_store").send(sent.items(), version=5)
    assert_same(transport_of(parcel).receive(parcel), sent)
    assert_same(transport_of(parcel).receive(parcel), sent)  # a second rollout rank


def test_an_unknown_transport_or_a_missing_folder_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'nccl'"):
        weight_transport("nccl")
    with pytest.raises(ValueError, match=r"async_training\.weight_dir"):
        weight_transport("filesystem")
    assert isinstance(transport_of(Parcel("filesystem", 1, "/tmp/x/policy_v1.safetensors")), Filesystem)
