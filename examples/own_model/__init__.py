"""A package of one's own, trained by ``train.py`` through ``_target_`` configs.

Nothing here imports the framework: a model (:class:`models.TinyMLP`), a dataset
(:class:`data.Stripes`, generated, no download), a topology registered with
``@TopologyReg.register`` (:class:`topology.Hub`) and a scheduler function
(:func:`schedule.warmup`), each named by a YAML file of ``conf/``. With this folder's
parent on ``PYTHONPATH``::

    PYTHONPATH=examples torchrun --standalone --nproc_per_node=2 train.py \\
        --config-dir examples/own_model/conf experiment=own_model
    PYTHONPATH=examples torchrun --standalone --nproc_per_node=2 train.py \\
        --config-dir examples/own_model/conf -m experiment=own_model topology=own_hub,ring
"""
