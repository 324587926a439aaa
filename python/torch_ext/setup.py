# SPDX-License-Identifier: Apache-2.0
"""`tpcomm-torch-ext`: the compiled eager path of tpcomm's PyTorch ops (`torch.ops.tpcomm_c`),
built against the PyTorch installed here (a build serves that PyTorch's ABI only, so it is a
package of its own; the `tpcomm` wheel stays independent of PyTorch):

    pip install --no-build-isolation python/torch_ext

It needs the `tpcomm` package (for the library it calls into) and the CUDA headers
(`CUDA_HOME`, default /usr/local/cuda); `tpcomm.torch` uses it when it is installed."""
import os
import re

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    VERSION = re.search(r"project\(tpcomm VERSION ([0-9]+\.[0-9]+\.[0-9]+)", f.read()).group(1)

setup(
    name="tpcomm-torch-ext",
    version=VERSION,
    description="The compiled eager path of tpcomm's PyTorch ops",
    license="Apache-2.0",
    ext_modules=[CppExtension(
        "tpcomm_torch_ext", [os.path.join(HERE, "tpcomm_torch_ext.cpp")],
        include_dirs=[os.path.join(ROOT, "include"), os.path.join(CUDA_HOME, "include")],
        libraries=["c10_cuda"], extra_compile_args=["-O2"])],
    cmdclass={"build_ext": BuildExtension},
)
