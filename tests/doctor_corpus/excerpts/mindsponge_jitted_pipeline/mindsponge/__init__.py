from grover.grover import Grover
