# expect: 1:1: comment_only.g is empty
# There is no graph in this file, only comments.
