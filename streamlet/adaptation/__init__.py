"""The control plane: policies that read statistics and change placement and routing."""
