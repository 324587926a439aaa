# SPDX-License-Identifier: Apache-2.0
"""`tpcomm-torch-ext`: the compiled eager path of tpcomm's PyTorch ops (`torch.ops.tpcomm_c`),
built against the PyTorch installed here (a build serves that PyTorch's ABI only, so it is a
package of its own; the `tpcomm` wheel stays independent of PyTorch):

    pip install --no-build-isolation python/torch_ext

It needs the `tpcomm` package (for the library it calls into) and the CUDA headers
(`CUDA_HOME`, default /usr/local/cuda); `tpcomm.torch` uses it when it is installed. The C++
runtime must be PyTorch's, linked dynamically: a build whose compiler linked libstdc++ into it
statically (a `CXX` wrapper adding -static-libstdc++) crashed with SIGSEGV whenever one of its ops
raised, so such a build is refused."""
import os
import re
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")



class BuildWithSharedRuntime(BuildExtension):
    """Refuses an extension that does not load libstdc++.so.6: it would carry a C++ runtime of
    its own beside PyTorch's, and an error thrown across the two crashed the process."""

    def build_extension(self, ext):
        super().build_extension(ext)
        path = self.get_ext_fullpath(ext.name)
        try:
            dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                                     check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return  # no readelf: nothing to check with
        if "libstdc++.so" not in dynamic:
            raise RuntimeError(
                f"{path} links the C++ runtime statically (does CXX={os.environ.get('CXX', 'c++')}"
                " add -static-libstdc++?): its errors would cross into PyTorch's runtime and "
                "crash. Build it with a compiler that links libstdc++ dynamically (CXX=g++).")


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
    cmdclass={"build_ext": BuildWithSharedRuntime},
)
