"""`oomguard serve`: plan, launch, proxy, watch, diagnose, relaunch.

A pure core (`engine`: the engine command as a frozen value; `policy`: the next configuration after a failure;
`state`: what happened, as data) under a thin process shell (`supervisor`) and its command line (`command`).
"""
