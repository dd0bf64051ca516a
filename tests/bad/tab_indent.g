# expect: 3:9: unknown op 'relux'
graph g(x: f32[4]) -> f32[4] {
	return relux(x)
}
