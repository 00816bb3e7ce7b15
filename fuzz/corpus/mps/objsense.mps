NAME T
OBJSENSE
    MAX
ROWS
 N obj
 L c1
COLUMNS
    MARKER MARKER INTORG
    x obj 1 c1 1
    MARKER MARKER INTEND
    y obj 2 c1 1
RHS
    rhs c1 4
RANGES
    rng c1 2
BOUNDS
 UP bnd x 3
 FR bnd y
ENDATA
