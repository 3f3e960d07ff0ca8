"""The official Python `kubernetes` client listing and watching VolumeAttachments.

Driven by tests/python_client.rs: prints one JSON line after the list, then one with the
watch events it saw (it stops after two).
"""
import json
import sys

from kubernetes import client, config, watch

config.load_kube_config(config_file=sys.argv[1])
api = client.StorageV1Api()
listed = api.list_volume_attachment()
print(json.dumps({
    "list": sorted(i.metadata.name for i in listed.items),
    "attachers": sorted({i.spec.attacher for i in listed.items}),
    "rv": listed.metadata.resource_version,
}), flush=True)

seen = []
w = watch.Watch()
for ev in w.stream(api.list_volume_attachment,
                   resource_version=listed.metadata.resource_version,
                   timeout_seconds=20):
    obj = ev["object"]
    attached = bool(obj.status and obj.status.attached)
    seen.append([ev["type"], obj.metadata.name, attached])
    if len(seen) >= 2:
        w.stop()
print(json.dumps({"events": seen}), flush=True)
