# Probe: which providers are built in, and what the plugin EP library exposes.
import onnxruntime as ort, onnxruntime_qnn as oq, os
print("onnxruntime", ort.__version__, "onnxruntime_qnn", oq.__version__, "qnn_version", oq.build_and_package_info.qnn_version)
print("get_available_providers():", ort.get_available_providers())
print("devices before register:", [(d.ep_name, d.device.type, d.ep_vendor) for d in ort.get_ep_devices()])
print("library path:", oq.get_library_path(), os.path.exists(oq.get_library_path()))
print("htp path:", oq.get_qnn_htp_path(), os.path.exists(oq.get_qnn_htp_path()))
print("cpu path:", oq.get_qnn_cpu_path(), os.path.exists(oq.get_qnn_cpu_path()))
ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
print("get_available_providers() after register:", ort.get_available_providers())
for d in ort.get_ep_devices():
    print("EpDevice:", d.ep_name, d.ep_vendor, "type=", d.device.type, "vendor=", d.device.vendor, "vendor_id=", hex(d.device.vendor_id), "device_id=", d.device.device_id,
          "ep_metadata=", dict(d.ep_metadata), "ep_options=", dict(d.ep_options), "dev_meta=", dict(d.device.metadata))
