"""Trees of tensors: walking them (``walk``), converting them (``convert``: convert_tree, plan_tree),
and the scanner that names what holds tensors a walk does not enter (``hints``)."""
