package engine

// Running is InBackground, by the name the tests know it.
func (c *Client) Running() int { return c.InBackground() }

// givingBackNow is the number of give-backs being tried at this moment.
func (c *Client) givingBackNow() int {
	c.gb.mu.Lock()
	defer c.gb.mu.Unlock()
	return c.gb.trying
}
