package engine

// Running is the number of background calls running now: Background's
// and the give-backs.
func (c *Client) Running() int { return len(c.bg) + len(c.gb) }
