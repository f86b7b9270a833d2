"""Only here to ship ``zerorun_deepspeed.pth`` (everything else is in pyproject.toml).

The ``.pth`` file is the startup hook of ``ZERORUN_AS_DEEPSPEED=1`` for a plain ``python``
or ``torchrun``: site-packages runs it at interpreter start; it imports nothing unless the
variable is set, and then puts zerorun's ``deepspeed`` compatibility directory on sys.path
(see zerorun/compat/activate.py). setuptools has no pyproject option to install a file
into the root of site-packages, so build_py copies it next to the packages (regular wheels)
and editable_wheel adds it to the editable wheel.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "zerorun_deepspeed.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH.name)]


class EditableWheelWithPth(editable_wheel):
    # everything in the unpacked-wheel directory goes into the editable wheel; this is the
    # one hook that receives it (setuptools >= 64)
    def _install_namespaces(self, installation_dir: str, pth_prefix: str) -> None:
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copy(PTH, Path(installation_dir) / PTH.name)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
