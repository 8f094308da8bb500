#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, the oracle of chorus's SummaryWriter tests.

    python3 tests/utils/read_tfevents.py FILE [FILE ...]

Prints JSON: for one FILE an object, for several a list of objects, each
    {"file", "events": [...], "records": N, "truncated": bool, "truncated_at": offset or null,
     "tail_bytes": n, "crc_error": null or {"offset", "field": "length"|"data", "stored", "computed"},
     "message": text}
Every event is decoded by Google's protobuf library (Debian's python3-protobuf) with the schema in
tensorboard_subset.proto next to this file, compiled by protoc at start-up; the TFRecord framing and
its CRC-32C are this file's own code. Nothing is shared with the C++ writer or reader under test.

Each event also says whether protobuf, serializing what it decoded, gives back the record's bytes
exactly ("canonical"): the C++ encoder then writes what protobuf itself (and so PyTorch) writes.
"unknown_fields" counts fields the schema does not know (a wrong field number shows up there).

Exit status: 0 (a truncated last record included: its writer was killed mid-append, and the records
before it are returned), 1 when a whole record fails its CRC (reading that file stops there),
3 when python3-protobuf or protoc is missing, 2 for usage errors.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SETUP_HINT = "run tools/setup.sh (it installs python3-protobuf and protobuf-compiler)"

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as e:  # the test must fail, not skip, without it
    sys.stderr.write(f"read_tfevents.py: python3's google.protobuf is missing ({e}): {SETUP_HINT}\n")
    sys.exit(3)


# --- CRC-32C (Castagnoli), table driven, and TFRecord's mask -----------------------------------
def _crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


# --- the schema ----------------------------------------------------------------------------------
def load_messages():
    here = os.path.dirname(os.path.abspath(__file__))
    protoc = shutil.which("protoc")
    if protoc is None:
        sys.stderr.write(f"read_tfevents.py: protoc is missing: {SETUP_HINT}\n")
        sys.exit(3)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "subset.pb")
        subprocess.run([protoc, f"--proto_path={here}", f"--descriptor_set_out={out}", "tensorboard_subset.proto"],
                       check=True)
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in files.file:
        pool.Add(fd)

    def cls(name):
        desc = pool.FindMessageTypeByName("chorus_tb_subset." + name)
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(desc)
        return message_factory.MessageFactory(pool).GetPrototype(desc)

    return {n: cls(n) for n in ("Event", "HParamsPluginData", "TextPluginData")}


M = load_messages()


# --- decoding to JSON-able values ----------------------------------------------------------------
def count_unknown(msg) -> int:
    """Fields the schema does not know, in msg and every message inside it."""
    n = len(msg.UnknownFields())
    for field, value in msg.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].type == field.TYPE_MESSAGE:
                n += sum(count_unknown(item) for item in value.values())
        elif field.label == field.LABEL_REPEATED:
            n += sum(count_unknown(item) for item in value)
        else:
            n += count_unknown(value)
    return n


def enum_name(msg, field_name, number):
    return msg.DESCRIPTOR.fields_by_name[field_name].enum_type.values_by_number[number].name


def hparams_content(content: bytes):
    data = M["HParamsPluginData"].FromString(content)
    out = {"version": data.version, "data": data.WhichOneof("data"),
           "canonical": data.SerializeToString(deterministic=True) == content,
           "unknown_fields": count_unknown(data)}
    if data.HasField("experiment"):
        exp = data.experiment
        out["experiment"] = {
            "hparam_infos": [{"name": h.name, "type": enum_name(h, "type", h.type)} for h in exp.hparam_infos],
            "metric_infos": [{"group": m.name.group, "tag": m.name.tag} for m in exp.metric_infos],
        }
    if data.HasField("session_start_info"):
        hp = {}
        for key, value in data.session_start_info.hparams.items():
            kind = value.WhichOneof("kind")
            hp[key] = {kind: getattr(value, kind)} if kind else {}
        out["session_start_info"] = {"hparams": hp}
    if data.HasField("session_end_info"):
        sei = data.session_end_info
        out["session_end_info"] = {"status": enum_name(sei, "status", sei.status)}
    return out


def value_to_json(v):
    out = {"tag": v.tag, "kind": v.WhichOneof("value")}
    if out["kind"] == "simple_value":
        out["simple_value"] = v.simple_value  # the float32, widened to a Python float exactly
    elif out["kind"] == "histo":
        h = v.histo
        out["histo"] = {"min": h.min, "max": h.max, "num": h.num, "sum": h.sum, "sum_squares": h.sum_squares,
                        "bucket_limit": list(h.bucket_limit), "bucket": list(h.bucket)}
    elif out["kind"] == "tensor":
        t = v.tensor
        out["tensor"] = {"dtype": enum_name(t, "dtype", t.dtype), "shape": [d.size for d in t.tensor_shape.dim],
                         "string_val": [s.decode("utf-8") for s in t.string_val],
                         "float_val": list(t.float_val), "double_val": list(t.double_val)}
    if v.HasField("metadata"):
        pd = v.metadata.plugin_data
        md = {"plugin_name": pd.plugin_name, "content_hex": pd.content.hex()}
        if pd.plugin_name == "hparams":
            md["hparams"] = hparams_content(pd.content)
        elif pd.plugin_name == "text":
            md["text"] = {"version": M["TextPluginData"].FromString(pd.content).version}
        out["metadata"] = md
    return out


def event_to_json(data: bytes, offset: int):
    ev = M["Event"].FromString(data)
    out = {"offset": offset, "wall_time": ev.wall_time, "step": ev.step, "what": ev.WhichOneof("what"),
           "canonical": ev.SerializeToString(deterministic=True) == data, "unknown_fields": count_unknown(ev)}
    if out["what"] == "file_version":
        out["file_version"] = ev.file_version
    elif out["what"] == "summary":
        out["values"] = [value_to_json(v) for v in ev.summary.value]
    return out


def read_file(path):
    with open(path, "rb") as f:
        buf = f.read()
    result = {"file": path, "events": [], "records": 0, "truncated": False, "truncated_at": None,
              "tail_bytes": 0, "crc_error": None, "message": ""}
    pos = 0
    while pos < len(buf):
        left = len(buf) - pos
        if left < 12:
            result.update(truncated=True, truncated_at=pos, tail_bytes=left)
            break
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (stored,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        computed = masked(crc32c(header))
        if stored != computed:
            result["crc_error"] = {"offset": pos, "field": "length", "stored": stored, "computed": computed}
            break
        if left < 12 + length + 4:
            result.update(truncated=True, truncated_at=pos, tail_bytes=left)
            break
        data = buf[pos + 12:pos + 12 + length]
        (stored,) = struct.unpack("<I", buf[pos + 12 + length:pos + 16 + length])
        computed = masked(crc32c(data))
        if stored != computed:
            result["crc_error"] = {"offset": pos, "field": "data", "stored": stored, "computed": computed}
            break
        result["events"].append(event_to_json(data, pos))
        result["records"] += 1
        pos += 12 + length + 4
    if result["crc_error"]:
        e = result["crc_error"]
        result["message"] = (f"{path}: CRC mismatch in the {e['field']} of the record at byte offset {e['offset']}: "
                             f"stored 0x{e['stored']:08x}, computed 0x{e['computed']:08x}")
    elif result["truncated"]:
        result["message"] = (f"{path}: truncated record at byte offset {result['truncated_at']} "
                             f"({result['tail_bytes']} bytes); {result['records']} whole records read")
    return result


def main(argv):
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    results = [read_file(p) for p in argv]
    for r in results:
        if r["message"]:
            sys.stderr.write("read_tfevents.py: " + r["message"] + "\n")
    json.dump(results[0] if len(results) == 1 else results, sys.stdout)
    sys.stdout.write("\n")
    return 1 if any(r["crc_error"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
