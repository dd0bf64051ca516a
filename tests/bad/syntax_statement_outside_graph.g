# expect: 2:1: unexpected 'x', expected 'graph', end of file
x = 1
