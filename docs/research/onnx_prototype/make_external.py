"""Re-saves a model with every initializer in an external data file, with python3-onnx 1.12
(Debian package, extracted: PYTHONPATH=root/usr/lib/python3/dist-packages LD_LIBRARY_PATH=root/usr/lib/x86_64-linux-gnu)."""
import os, sys, onnx
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
onnx.save_model(m, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                location=os.path.basename(dst) + ".data", size_threshold=0)
print(dst, os.path.getsize(dst), os.path.getsize(dst + ".data"))
