"""How a run executes, apart from what it computes: the processes it is split over, CUDA graphs and compiled kernels
around the algorithm's steps, and the one way results cross from the device to the host."""
