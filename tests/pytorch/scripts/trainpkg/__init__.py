# A package so that `torchrun -m trainpkg.collect` (and `ddprun -m`) has a module to run.
