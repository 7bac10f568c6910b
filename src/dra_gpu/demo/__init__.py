"""`dra-gpu demo`: the whole driver on one machine, with a simulated cluster and simulated GPUs."""
