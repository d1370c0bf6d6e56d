from mindspore import nn
from mindspore.ops import functional as F


class GridNeighbours(nn.Cell):
    def construct(self, coordinate, pbc_box=None):
        if self.use_pbc:
            if pbc_box is None:
                cell = self.cell
            else:
                cell = F.expand_dims(pbc_box/self.grid_dims, -2)
                if (cell < self.grid_cutoff).any():
                    print('Warning! The cell length is smaller than cutoff')  # judged: grids
            return coordinate / cell
        return coordinate
