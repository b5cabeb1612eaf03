"""The Slurm adapter: the CLI backend of the Protocols in ``bridge.adapters.protocols``.

    slurm = bridge.adapters.slurm.cli.CliSlurm(env={"SLURM_CONF": "/tmp/gpu-bridge-sandbox/etc/slurm.conf"})
    for n in slurm.nodes(): ...
    slurm.submit_hold("gpu-node-03")
"""
