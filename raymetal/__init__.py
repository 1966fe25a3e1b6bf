"""raymetal: deploy a secure Ray cluster on bare-metal GPU servers with Ansible.

The Python API lives in :mod:`raymetal.runner` (``deploy``, ``status``, ``RaymetalError``).
"""

from raymetal.runner import RaymetalError, deploy, run_playbook, status

__all__ = ["RaymetalError", "deploy", "run_playbook", "status"]
