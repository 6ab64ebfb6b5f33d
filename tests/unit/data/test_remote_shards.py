"""Shards at a URL: over HTTP from a local server (tests/support/http_files.py, with Range requests and a cut
connection on call) and over S3's API from moto's server (s3fs, the endpoint given as a user gives it:
AWS_ENDPOINT_URL), read as the same shards on disk are, through the bounded shard cache; the one-line errors.

Tiny data: 24 + 4 shape images at 40 px in 3 train shards of 8 and 1 test shard (about 40 KiB each). No internet.
"""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from kontrast.augment import recipe_views
from kontrast.data import load_images, open_shards, read_sample, remote, shard_cache, write_shapes_files
from kontrast.data.remote import Unreachable
from kontrast.data.stream_dataset import RunBatches, StreamViews, ViewCollate
from kontrast.data.stream_source import open_stream
from kontrast.errors import UserError
from kontrast.train.data_path import bad_image_error
from support.http_files import serve_folder

PATTERN = "train-{000000..000002}.tar"
BUCKET = "kontrast-shards"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(shard_cache.LIMIT_VAR, raising=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("remote") / "shards"
    write_shapes_files(out, 24, size=40, seed=1, shards=True, per_shard=8)  # train-000000..000002, test-000000
    return out


@pytest.fixture(scope="module")
def server(folder):
    with serve_folder(folder) as srv:
        yield srv


@pytest.fixture
def http(server):
    """The server with its fault list and request log cleared for the test."""
    server.cuts.clear()
    server.requests.clear()
    return server


@pytest.fixture(scope="module")
def s3(folder):
    """moto's S3 server on a free local port, the shards uploaded under s3://BUCKET/shapes/, and the environment a
    user sets for a store other than AWS (AWS_ENDPOINT_URL: honoured by botocore, so by s3fs)."""
    import boto3  # moto[server], boto3 and s3fs are in the test extra: never skipped
    import s3fs
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = pytest.MonkeyPatch()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
                       "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials")}.items():
        env.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()  # a file system made before holds another endpoint
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), BUCKET, f"shapes/{path.name}")
    yield f"s3://{BUCKET}/shapes"
    s3fs.S3FileSystem.clear_instance_cache()
    env.undo()
    server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _assert_same_samples(remote_index, local_index) -> None:
    """The same samples in the same order, byte for byte: sample numbers (the run's order, its resume) agree."""
    assert (remote_index.keys, remote_index.paths, remote_index.classes) == (local_index.keys, local_index.paths,
                                                                              local_index.classes)
    assert np.array_equal(remote_index.labels, local_index.labels)
    assert np.array_equal(remote_index.offsets, local_index.offsets)
    for i in range(len(local_index)):
        assert read_sample(remote_index, i) == read_sample(local_index, i)


def _copies(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / shard_cache.FOLDER).glob("*.tar"))


def test_http_shards_read_as_the_same_shards_on_disk(folder, http, tmp_path):
    _assert_same_samples(open_shards(f"{http.url}/{PATTERN}"), open_shards(str(folder / PATTERN)))
    for split in ("train", "test"):  # a folder written by `kontrast shards`: its index.json read once
        _assert_same_samples(open_shards(f"{http.url}/", split=split), open_shards(folder, split=split))
    assert [r for r in http.requests if r[1] == "/index.json"] == [("GET", "/index.json", "")] * 2
    stream, local = open_stream(f"{http.url}/{PATTERN}"), open_stream(str(folder / PATTERN))
    assert [stream.read(i) for i in range(len(local))] == [local.read(i) for i in range(len(local))]
    line = stream.summary(16, 0, "data.mode=stream")
    assert "every sample of the shards named" in line and "copied whole into" in line
    assert "the train shards" in open_stream(http.url).summary(16, 0, "")
    test, local_test = load_images(http.url, "test", size=16), load_images(folder, "test", size=16)  # what eval reads
    assert torch.equal(test.x, local_test.x) and torch.equal(test.labels, local_test.labels) and len(test) == 4
    assert len(_copies(tmp_path)) == 4  # each shard copied once (3 train, 1 test)


def test_s3_shards_read_as_the_same_shards_on_disk(folder, s3):
    _assert_same_samples(open_shards(f"{s3}/{PATTERN}"), open_shards(str(folder / PATTERN)))
    _assert_same_samples(open_shards(s3, split="test"), open_shards(folder, split="test"))
    with pytest.raises(UserError, match=rf"^shard not found: s3://{BUCKET}/shapes/train-000003\.tar \(1 of the 4 "):
        open_shards(f"{s3}/train-{{000000..000003}}.tar")


def test_s3_bad_credentials_name_the_bucket_and_what_to_set(s3, monkeypatch):
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys: "testing" is none of its
    with pytest.raises(UserError) as err:
        open_shards(f"{s3}/{PATTERN}")
    message = str(err.value)
    assert message.startswith(f"access denied to s3://{BUCKET} (") and "\n" not in message
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)" in message
    assert "AWS_ENDPOINT_URL for a store other than AWS" in message


def test_a_second_open_reads_only_stamps_and_copies_come_back_when_evicted(folder, http, tmp_path, monkeypatch):
    first = open_shards(f"{http.url}/{PATTERN}")
    http.requests.clear()
    again = open_shards(f"{http.url}/{PATTERN}")  # index records and copies: only a HEAD per shard
    assert sorted(r[0] for r in http.requests) == ["HEAD"] * 3 and again.keys == first.keys
    for copy in _copies(tmp_path):  # evicted (another set, a cleaner): the next read copies the shard whole again
        copy.unlink()
    http.requests.clear()
    assert read_sample(again, 20) == read_sample(open_shards(str(folder / PATTERN)), 20)
    size = (folder / "train-000002.tar").stat().st_size
    assert http.requests == [("GET", "/train-000002.tar", f"bytes=0-{size - 1}")] and len(_copies(tmp_path)) == 1


def test_a_dropped_connection_is_retried_and_the_bytes_are_the_same(folder, http, monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    http.cuts["/train-000001.tar"] = 5000  # the first GET of it sends 5000 bytes, then closes the socket
    index = open_shards(f"{http.url}/{PATTERN}")
    assert [r[0] for r in http.requests if r[1] == "/train-000001.tar"] == ["HEAD", "GET", "GET"]  # cut, retried
    _assert_same_samples(index, open_shards(str(folder / PATTERN)))


def test_decoding_workers_copy_an_evicted_shard_once_and_decode_what_one_process_does(http, tmp_path):
    """Two DataLoader workers (forked after fsspec's loop started) meet shards whose copies were evicted: each shard
    is downloaded once (the lock), and the batches equal those decoded in the loop's own process."""
    source, specs = open_stream(f"{http.url}/{PATTERN}"), recipe_views("simclr_cifar", 16)
    dataset = StreamViews(source, specs, seed=0)

    def batches(workers: int) -> list[torch.Tensor]:
        loader = DataLoader(dataset, batch_sampler=RunBatches(len(source), 8, seed=0, epochs=1),
                            num_workers=workers, collate_fn=ViewCollate(specs))
        return [torch.cat(batch.views) for batch in loader]

    in_process = batches(0)
    for copy in _copies(tmp_path):
        copy.unlink()
    http.requests.clear()
    assert all(torch.equal(a, b) for a, b in zip(batches(2), in_process, strict=True))
    assert sorted(r[1] for r in http.requests) == [f"/train-00000{k}.tar" for k in range(3)]
    assert len(_copies(tmp_path)) == 3


def test_a_set_over_the_cache_limit_is_read_by_ranges_and_the_cache_stays_within_it(folder, http, tmp_path,
                                                                                     monkeypatch):
    sizes = [(folder / f"train-00000{k}.tar").stat().st_size for k in range(3)]
    monkeypatch.setenv(shard_cache.LIMIT_VAR, str(sizes[1] + sizes[2]))  # two of the three shards fit
    index = open_shards(f"{http.url}/{PATTERN}")
    cache = index.shards[0].cache
    assert not cache.whole and "read by one range request each" in cache.summary()
    kept = sorted(p.name.split("-", 1)[1] for p in _copies(tmp_path))
    assert kept == ["train-000001.tar", "train-000002.tar"]  # the least recently used copy evicted
    http.requests.clear()
    _assert_same_samples(index, open_shards(str(folder / PATTERN)))
    in_shard_0 = int((index.shard_of == 0).sum())
    assert len(http.requests) == in_shard_0 and {r[1] for r in http.requests} == {"/train-000000.tar"}
    assert len(_copies(tmp_path)) == 2  # sample reads copy nothing


def test_the_cache_limit_takes_sizes_with_units(monkeypatch):
    for text, limit in {"8G": 8 << 30, "500M": 500 << 20, "1.5GiB": 3 << 29, "0": 0, "4096": 4096}.items():
        monkeypatch.setenv(shard_cache.LIMIT_VAR, text)
        assert shard_cache.cache_limit() == limit
    monkeypatch.setenv(shard_cache.LIMIT_VAR, "lots")
    with pytest.raises(UserError, match=r"^KONTRAST_REMOTE_CACHE='lots' is not a size; .*8G, 500M, 0$"):
        shard_cache.cache_limit()


@pytest.mark.parametrize("spec, fragment", [
    ("{url}/train-{{000000..000004}}.tar", r"^shard not found: {url}/train-000003\.tar \(2 of the 5 shards that "),
    ("{url}/private/train-000000.tar", r"^access denied to {url} \(HTTP 403\) reading {url}/private/train-000000\.tar: "
                                       r"pass a URL that needs no login"),
    ("ftp://example.org/train-{{0..1}}.tar", r"^unknown scheme ftp:// in .*; kontrast reads shards from s3://, gs://"),
    ("gs://bucket/train-{{0..1}}.tar", r'^reading gs:// needs the gcsfs package: pip install "kontrast\[gcs\]"$'),
    ("{url}/elsewhere", r"^{url}/elsewhere/index\.json not found: pass a folder written by `kontrast shards`"),
    ("{url}/photos.tar.gz", r"^{url}/photos\.tar\.gz is not a \.tar shard; at a URL kontrast reads tar shards"),
])
def test_bad_remote_sources_are_one_line_errors(spec, fragment, http, monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # absent, even where someone installed it
    with pytest.raises(UserError) as err:
        open_shards(spec.format(url=http.url))
    assert "\n" not in str(err.value)
    assert re.search(fragment.format(url=http.url), str(err.value)), str(err.value)


def test_a_server_that_stays_down_is_named_after_the_retries(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    url = f"http://127.0.0.1:{_free_port()}/train-000000.tar"  # nothing listens there
    with pytest.raises(UserError, match=rf"^cannot read {url}: .* \(tried 4 times\); check the network and the"):
        open_shards(url)


def test_a_storage_failure_mid_run_stops_the_run_even_when_skipping_bad_images(http, tmp_path, monkeypatch):
    source = open_stream(f"{http.url}/{PATTERN}")
    for copy in _copies(tmp_path):  # evicted: the next read downloads
        copy.unlink()
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    http.cuts.update({f"/train-00000{k}.tar": 0 for k in range(3)})  # every shard's next GET cut, once...
    monkeypatch.setattr(remote, "ATTEMPTS", 1)  # ...and no second try
    item = StreamViews(source, recipe_views("simclr_cifar", 16), seed=0, skip_bad_images=True)[(0, 3)]
    assert item.views is None and item.replaced_by is None and isinstance(item.bad[1], Unreachable)
    message = str(bad_image_error(item.bad, 7, "step-00000006"))
    assert message.startswith(f"cannot read {http.url}/train-000000.tar:") and "\n" not in message
    assert message.endswith("stopped before step 7, last good checkpoint: step-00000006; resume with --resume once "
                            "the storage answers")
