"""The candidate accelerator under test: parsing `--candidate SPEC` and installing it (candidates.py), the
environment that carries it into every process a check starts (candidate_env.py), and the start-up hook that
installs it there (candidate_site/)."""
