"""Branch pruning of a trained Weighted Transformer (`wtnmt prune`): which branches go
(``criteria``) and the pruned run directory (``run``). Importing the package imports no torch:
the command line's parser lives here too (``arguments``)."""
